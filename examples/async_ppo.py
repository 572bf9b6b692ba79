"""CleanRL-style PPO on CartPole with asynchronous stepping (``recv``/``send``).

A single-file, top-to-bottom PPO in the manner of CleanRL's ``ppo.py``, but the rollout runs
on subvec's first-k-ready stepping instead of lock-step ``step()``: ``recv()`` returns the
first ``batch_size`` envs that are ready, the policy acts on them while the other envs are
still stepping, and ``send()`` gives those envs their actions::

    envs = subvec.SubprocVectorEnv(env_fns, batch_size=4, autoreset_mode=SAME_STEP)
    envs.async_reset(seed=...)
    obs, rew, term, trunc, infos = envs.recv()    # the first 4 ready; infos["env_id"]
    envs.send(actions, infos["env_id"])

Since the rows of a ``recv`` come from whichever envs were ready, the rollout storage is per
env id: each env keeps its own trajectory buffer (obs, action, logprob, reward, done, value),
filled as its rows come back. An env whose buffer holds ``num_steps`` transitions is sent no
more actions; once every env's buffer is full, GAE runs per env and the PPO update runs on the
whole batch, then every env gets its next action and the rollout goes on. Same-step autoreset
makes every row a real transition: the row that ends an episode carries the next episode's
first observation (the final one is in ``infos["final_obs"]``), so no row is a reset to skip.

Episodic returns come from ``RecordEpisodeStatistics`` inside each env's factory: per-env
wrappers see exactly their env's trajectory, whatever order the rows come back in (the
vector-level wrappers of ``gymnasium.wrappers.vector`` wrap ``step()`` and do not apply to
``recv()``). With same-step autoreset the statistics are in ``infos["final_info"]``.

On the project's 2-vCPU machine, with the defaults (8 envs, recv batches of 4, 128 steps per
env per update, 97 updates, seed 1), the mean episodic return of the last 20 episodes reaches
about 200 after all 99,328 env-steps (201 and 213 in two runs: which envs are ready first
depends on timing, so runs differ), in about 12 s of training on a quiet machine and 30 s while
other jobs shared its cores.

Run:  python examples/async_ppo.py                          # the defaults above
      python examples/async_ppo.py --total-timesteps 4096   # a smoke run
Needs torch (``pip install torch``).
"""

import argparse
import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn, optim
from torch.distributions.categorical import Categorical

import subvec


@dataclass
class Args:
    env_id: str = "CartPole-v1"
    """the id of the environment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    total_timesteps: int = 100_000
    """total timesteps of the experiment"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    recv_batch: int = 4
    """how many envs each recv() returns (subvec's batch_size): the first ready"""
    num_workers: int = 0
    """the number of worker processes (0: one per usable CPU, at most num_envs)"""
    num_steps: int = 128
    """the number of transitions each env collects per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float = 0.0
    """the target KL divergence threshold (0: no early stop)"""

    # filled in at run time
    batch_size: int = 0
    minibatch_size: int = 0
    num_iterations: int = 0


def parse_args() -> Args:
    """A flag per field of Args (``--total-timesteps 5000``, ``--anneal-lr false``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(Args):
        if f.name in ("batch_size", "minibatch_size", "num_iterations"):
            continue
        kind: Callable[[str], Any] = type(f.default)
        if kind is bool:
            kind = lambda s: s.lower() in ("1", "true", "yes", "on")  # noqa: E731
        parser.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default)
    return Args(**vars(parser.parse_args()))


def make_env(env_id: str) -> Callable[[], gym.Env]:
    def thunk() -> gym.Env:
        env = gym.make(env_id)
        # Per env: info["episode"] = {"r": return, "l": length, "t": time} at each episode's end.
        return gym.wrappers.RecordEpisodeStatistics(env)

    return thunk


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs: gym.vector.VectorEnv) -> None:
        super().__init__()
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, envs.single_action_space.n), std=0.01),
        )

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(
        self, x: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


if __name__ == "__main__":
    args = parse_args()
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = max(1, args.total_timesteps // args.batch_size)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    # A 64-unit MLP gains nothing from intra-op threads; they would only contend with the
    # env workers for the cores.
    torch.set_num_threads(1)

    envs = subvec.SubprocVectorEnv(
        [make_env(args.env_id) for _ in range(args.num_envs)],
        batch_size=args.recv_batch,
        autoreset_mode="SameStep",  # gymnasium 1.1+: AutoresetMode.SAME_STEP
        num_workers=args.num_workers or None,
    )
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "discrete actions only"
    obs_shape = envs.single_observation_space.shape
    n, T = args.num_envs, args.num_steps

    agent = Agent(envs)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # Rollout storage, per env id: row e is env e's trajectory, filled up to ptr[e].
    obs = torch.zeros((n, T, *obs_shape))
    actions = torch.zeros((n, T), dtype=torch.long)
    logprobs = torch.zeros((n, T))
    rewards = torch.zeros((n, T))
    dones = torch.zeros((n, T))  # dones[e, t]: the step taken at t ended the episode
    values = torch.zeros((n, T))
    ptr = np.zeros(n, dtype=np.int64)  # transitions env e holds in this rollout
    waiting = np.zeros(n, dtype=bool)  # env e was sent an action whose row is not back yet
    next_obs = torch.zeros((n, *obs_shape))  # the observation each env acts on next

    def act(ids: np.ndarray) -> None:
        """Store each env's observation, pick its action, and send the actions."""
        x = next_obs[ids]
        with torch.no_grad():
            action, logprob, _, value = agent.get_action_and_value(x)
        t = ptr[ids]
        obs[ids, t] = x
        actions[ids, t] = action
        logprobs[ids, t] = logprob
        values[ids, t] = value.flatten()
        envs.send(action.numpy(), ids)
        waiting[ids] = True

    global_step = 0
    episode_returns: list[float] = []
    start_time = time.time()
    envs.async_reset(seed=args.seed)

    for iteration in range(1, args.num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        if iteration > 1:  # every env is parked with a full buffer: start them all again
            act(np.arange(n))
        # Collect until every env holds num_steps transitions.
        while (ptr < T).any():
            next_obs_np, reward, terminations, truncations, infos = envs.recv()
            ids = infos["env_id"]
            # Rows of envs that were sent an action close that transition; the others are
            # the first observations after async_reset.
            back = waiting[ids]
            done_ids, t = ids[back], ptr[ids[back]]
            rewards[done_ids, t] = torch.as_tensor(reward[back], dtype=torch.float32)
            ended = np.logical_or(terminations, truncations)[back]
            dones[done_ids, t] = torch.as_tensor(ended, dtype=torch.float32)
            ptr[done_ids] += 1
            waiting[done_ids] = False
            global_step += len(done_ids)
            next_obs[ids] = torch.as_tensor(next_obs_np)

            # Same-step autoreset: the statistics of the episodes that just ended.
            final = infos.get("final_info", {})
            if "episode" in final:
                for r in final["episode"]["r"][final["_episode"]]:
                    episode_returns.append(float(r))
                    print(f"global_step={global_step}, episodic_return={float(r):.1f}")

            # Envs with room in their buffer get their next action; the others wait.
            room = ids[ptr[ids] < T]
            if len(room):
                act(room)

        # Generalized advantage estimation per env, bootstrapped from each env's next obs
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(n)
            advantages = torch.zeros_like(rewards)
            lastgaelam = torch.zeros(n)
            for t in reversed(range(T)):
                nextnonterminal = 1.0 - dones[:, t]
                nextvalues = next_value if t == T - 1 else values[:, t + 1]
                delta = rewards[:, t] + args.gamma * nextvalues * nextnonterminal - values[:, t]
                lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                advantages[:, t] = lastgaelam
            returns = advantages + values
        ptr[:] = 0

        # Flatten the batch
        b_obs = obs.reshape((-1, *obs_shape))
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Optimize the policy and value network
        b_inds = np.arange(args.batch_size)
        clipfracs = []
        for _epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start : start + args.minibatch_size]

                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[mb_inds], b_actions[mb_inds]
                )
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (
                        mb_advantages.std() + 1e-8
                    )

                # Clipped surrogate objective
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(
                    ratio, 1 - args.clip_coef, 1 + args.clip_coef
                )
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss, optionally clipped around the rollout's values
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            if args.target_kl and approx_kl > args.target_kl:
                break

        y_pred, y_true = b_values.numpy(), b_returns.numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
        sps = int(global_step / (time.time() - start_time))
        print(
            f"iteration={iteration} SPS={sps} value_loss={v_loss.item():.3f} "
            f"policy_loss={pg_loss.item():.4f} approx_kl={approx_kl.item():.4f} "
            f"clipfrac={np.mean(clipfracs):.3f} explained_variance={explained_var:.3f}"
        )

    envs.close()
    recent = episode_returns[-20:]
    summary = f"{np.mean(recent):.1f}" if recent else "n/a"
    elapsed = time.time() - start_time
    print(
        f"episodes={len(episode_returns)} env_steps={global_step} "
        f"mean_return_last_20={summary} seconds={elapsed:.0f}"
    )
