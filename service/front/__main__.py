"""`python -m service.front`: the front process (what `inference-server` runs)."""

from service.front.server import main

main()
