from core.cli import main

main()
