import sys

from oomsight.cli import main

sys.exit(main())
