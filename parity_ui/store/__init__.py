"""runs.db, through sqlite-utils: the only package that speaks SQL. Migrations, the runs and their
parts, and the named reads and writes the commands, the report and the app use.

May import: core, inputs.
"""
