"""`python -m art_proxy.cli`: how the ranks of `art-proxy train --nproc N` start."""

from art_proxy.cli.app import main

main()
