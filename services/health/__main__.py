"""`python -m services.health` / `respawn-health`."""

from services.health.service import run


def main() -> None:
    run()


if __name__ == "__main__":
    main()
