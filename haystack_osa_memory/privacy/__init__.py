"""Privacy: what is redacted (private addresses, user paths, e-mail, secrets) and what is refused."""
