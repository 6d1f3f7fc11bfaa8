"""The trainer's typed configuration lives with the other settings (art_proxy.config), so the CLI
can offer its flags without importing torch."""

from __future__ import annotations

from art_proxy.config import TrainerConfig

__all__ = ["TrainerConfig"]
