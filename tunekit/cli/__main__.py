"""`python -m tunekit.cli ...`: the same as the `tunekit` command."""
import sys

from . import main

sys.exit(main())
