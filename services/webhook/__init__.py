"""The AppWrapper admission webhook (defaulting and validation), its own Deployment."""
