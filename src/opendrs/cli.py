"""Command-line interface (placeholder replaced below)."""


def main() -> int:
    return 0
