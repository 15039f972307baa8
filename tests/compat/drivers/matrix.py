"""The driver matrix for the Python drivers, each with its default options:
PyMySQL, mysql-connector-python, mysqlclient (MySQLdb). Usage:
matrix.py DRIVER PORT DATABASE TABLE. The table is partitioned by MOD(2) of
id over two backends; run.sh checks the rows on the backends afterwards."""
import sys

driver, port, database, table = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

if driver == "pymysql":
    import pymysql as db
    conn = db.connect(host="127.0.0.1", port=port, user="root", password="", database=database)
    prepared = None  # PyMySQL binds on the client only
elif driver == "mysql-connector-python":
    import mysql.connector as db
    conn = db.connect(host="127.0.0.1", port=port, user="root", password="", database=database)
    prepared = lambda: conn.cursor(prepared=True)  # offered: server-side prepared
elif driver == "mysqlclient":
    import MySQLdb as db
    conn = db.connect(host="127.0.0.1", port=port, user="root", password="", database=database)
    prepared = None  # mysqlclient binds on the client only
else:
    sys.exit(f"unknown driver {driver}")

insert = f"INSERT INTO {table} VALUES (%s, %s, %s)"
cur = conn.cursor()

# A multi-row INSERT over both backends, committed.
cur.execute(f"INSERT INTO {table} VALUES (1, 'a', 10), (2, 'b', 20)")
conn.commit()
# A transaction over both, committed through the driver's API.
cur.execute(f"INSERT INTO {table} VALUES (3, 'c', 30)")
cur.execute(f"INSERT INTO {table} VALUES (4, 'd', 40)")
conn.commit()
# The same with bound parameters (the driver's own binding, then prepared
# on the server where the driver offers it).
cur.execute(insert, (5, "e", 50))
cur.execute(insert, (6, "f", 60))
conn.commit()
if prepared is not None:
    pcur = prepared()
    pcur.execute(insert, (15, "p", 150))
    pcur.execute(insert, (16, "q", 160))
    conn.commit()
    pcur.close()
# One rolled back.
cur.execute(insert, (7, "g", 70))
cur.execute(insert, (8, "h", 80))
conn.rollback()
# A duplicate key on the second backend inside a transaction: the
# application rolls the whole transaction back.
cur.execute(insert, (9, "i", 90))
cur.execute(insert, (10, "j", 100))
try:
    cur.execute(insert, (1, "dup", 0))
    sys.exit("the duplicate key was accepted")
except db.IntegrityError as e:
    assert e.args[0] == 1062, e
conn.rollback()
# SAVEPOINT and ROLLBACK TO over both backends.
cur.execute(insert, (11, "k", 110))
cur.execute(insert, (12, "l", 120))
cur.execute("SAVEPOINT s")
cur.execute(insert, (13, "m", 130))
cur.execute(insert, (14, "n", 140))
cur.execute("ROLLBACK TO SAVEPOINT s")
conn.commit()
# Read back.
cur.execute(f"SELECT id, owner, amount FROM {table} ORDER BY id")
ids = [row[0] for row in cur.fetchall()]
want = [1, 2, 3, 4, 5, 6, 11, 12] + ([15, 16] if prepared is not None else [])
assert ids == sorted(want), (ids, want)
cur.execute("XA RECOVER")
assert cur.fetchall() in ((), []), "hscale lists no branch"
conn.close()
print(" ".join(str(i) for i in ids))
