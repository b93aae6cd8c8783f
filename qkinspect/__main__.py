from qkinspect.cli.app import main

main()
