from ebb.cli import main

main()
