from tunaflow.cli import main

main()
