from ebb.cli.main import main

main()
