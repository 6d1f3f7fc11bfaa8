"""Fakes that ship with art-proxy so users can test their own code too."""
