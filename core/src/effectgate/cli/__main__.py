"""`python -m effectgate.cli`: the `effectgate` command."""

from . import main

raise SystemExit(main())
