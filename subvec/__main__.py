import sys

from subvec.cli import main

sys.exit(main())
