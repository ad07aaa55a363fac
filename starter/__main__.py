from starter.cli import main

main()
