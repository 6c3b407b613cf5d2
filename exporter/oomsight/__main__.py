import sys

from oomsight.tools.cli import main

sys.exit(main())
