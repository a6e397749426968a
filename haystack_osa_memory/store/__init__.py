"""Database access: schema, governed facts and tokens. All SQL of the package lives here."""
