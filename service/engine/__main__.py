"""`python -m service.engine`: an engine process, started by the front."""

from service.engine.serve import main

main()
