"""`python -m scheduler.agent`: the node agent without Django (same flags as run_agent)."""

import sys

from scheduler.agent.command import main

sys.exit(main())
