"""The page where staff create, revoke and prioritise the API keys home apps use."""
