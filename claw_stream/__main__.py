from claw_stream.cli import main

main()
