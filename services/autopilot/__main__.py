"""`python -m services.autopilot` / `respawn-autopilot`."""

from services.autopilot.service import run


def main() -> None:
    run()


if __name__ == "__main__":
    main()
