from .shard import main

main()
