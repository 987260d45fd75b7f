from .router import main

main()
