"""What the migrations install on PostgreSQL: the record table's functions and partitions.

``functions`` holds the SQL of the server-side functions and trigger; ``tables`` what
the initial migration does with them (``install``, ``uninstall``) and the conversions
between the plain and the day-partitioned table. The migrations import this package:
it keeps its name and place. A change to what is installed ships as a new migration,
with its statements added here beside those it replaces.
"""
