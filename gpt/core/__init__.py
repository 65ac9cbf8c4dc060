"""The core every stage stands on: the config (schema, checks, the command line and TOML), errors, files, units, the optional packages, the torch versions, seeding."""
