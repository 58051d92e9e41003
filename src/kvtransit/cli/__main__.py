import sys

from kvtransit.cli import main

sys.exit(main())
