from harness.gateway.server import main

main()
