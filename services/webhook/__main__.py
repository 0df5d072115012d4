"""`python -m services.webhook` / `respawn-webhook`."""

from services.webhook.server import main

if __name__ == "__main__":
    main()
