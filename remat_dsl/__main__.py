import sys

from remat_dsl.cli import main

sys.exit(main())
