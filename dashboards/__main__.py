import sys

from dashboards.generator import main

sys.exit(main())
