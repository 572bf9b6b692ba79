"""The process backend: worker processes, pipes, shared memory, placement."""
