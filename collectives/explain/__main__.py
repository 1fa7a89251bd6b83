import sys

from ..teaching.explain import main

sys.exit(main())
