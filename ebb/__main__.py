import sys

from ebb.services import SERVICES

if len(sys.argv) == 2 and sys.argv[1] in SERVICES:
    # A long-running platform process: started without the command line's imports.
    SERVICES[sys.argv[1]]()
else:
    from ebb.cli.main import main

    main()
