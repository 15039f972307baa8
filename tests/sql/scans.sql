# Full partition scans: concatenation, ORDER BY, LIMIT and OFFSET (past the
# end too), aggregates, GROUP BY, HAVING, DISTINCT, NULLs, DECIMAL, strings
# that differ only in case or trailing spaces, empty partitions and results.

-- partition items id MOD(6) 1 2 3 5
-- partition events id DIV(100) 0 1 2 9

CREATE TABLE items (
  id INT PRIMARY KEY,
  grp INT,
  name VARCHAR(20) COLLATE utf8mb4_general_ci,
  price DECIMAL(10,2),
  qty BIGINT UNSIGNED,
  made DATETIME,
  label VARCHAR(8) COLLATE utf8mb4_unicode_ci
);
INSERT INTO items
  SELECT seq,
         NULLIF(seq % 5, 4),
         ELT(1 + seq % 6, 'apple', 'Apple', 'APPLE ', 'banana', 'Banana', 'cherry'),
         IF(seq % 9 = 0, NULL, (CAST(seq AS SIGNED) * 37 % 1000 - 500) / 4),
         IF(seq % 11 = 0, 18446744073709551000 + seq % 7, seq * 1000003 % 97),
         '2020-01-01' + INTERVAL (seq * 7919 % 1000) HOUR,
         ELT(1 + seq % 4, 'a', 'ä', 'ß', 'ss')
  FROM seq_1_to_200;

# Partition 9 (ids 900 to 999) stays empty.
CREATE TABLE events (id INT PRIMARY KEY, kind VARCHAR(10), at DATE);
INSERT INTO events
  SELECT seq, ELT(1 + seq % 3, 'click', 'view', 'buy'), '2024-02-01' + INTERVAL seq % 40 DAY
  FROM seq_0_to_349;

-- queries

SELECT * FROM items;
SELECT id, name FROM items WHERE grp = 2;
SELECT id, price FROM items WHERE id IN (1, 7, 13, 200, 999);
SELECT * FROM events WHERE id > 250;

-- ordered
SELECT id, name FROM items ORDER BY name, id;
-- ordered
SELECT id, price FROM items ORDER BY price DESC, id LIMIT 10;
-- ordered
SELECT id, made FROM items ORDER BY made, id LIMIT 5 OFFSET 20;
-- ordered
SELECT id, qty FROM items ORDER BY qty DESC, id LIMIT 8;
-- ordered
SELECT id, label FROM items ORDER BY label, id DESC LIMIT 12;
-- ordered
SELECT id, grp FROM items ORDER BY grp, id DESC LIMIT 15;
-- ordered
SELECT id, price * 2 AS doubled FROM items ORDER BY doubled, id LIMIT 7;
-- ordered
SELECT id FROM items ORDER BY id LIMIT 10 OFFSET 195;
-- ordered
SELECT id FROM items ORDER BY id LIMIT 10 OFFSET 500;
-- ordered
SELECT id, kind FROM events ORDER BY at DESC, id LIMIT 6;

# Empty results.
SELECT * FROM items WHERE id < 0;
SELECT COUNT(*), SUM(price), MIN(name), MAX(made), AVG(price) FROM items WHERE id < 0;
SELECT grp, COUNT(*) FROM items WHERE id < 0 GROUP BY grp;

# Which of several strings equal in their collation ('apple', 'Apple' and
# 'APPLE ' in general_ci; 'ß' and 'ss', 'a' and 'ä' in unicode_ci) a MIN, a
# MAX or a group shows is up to the server, for one table too: these queries
# show strings all such rows share.
SELECT COUNT(*), COUNT(grp), SUM(price), MIN(price), MAX(price), AVG(price) FROM items;
SELECT MAX(name), MIN(TRIM(UPPER(name))), MIN(made), MAX(qty), SUM(qty), AVG(qty) FROM items;
SELECT COUNT(*), MIN(at), MAX(at) FROM events;
SELECT grp, COUNT(*), SUM(price), AVG(price), MIN(made) FROM items GROUP BY grp;
SELECT TRIM(LOWER(name)), COUNT(*), MAX(price) FROM items GROUP BY name;
SELECT HEX(WEIGHT_STRING(label)), COUNT(*) FROM items GROUP BY label;
SELECT kind, at, COUNT(*) FROM events GROUP BY kind, at;
SELECT grp, COUNT(*) AS c, SUM(price) AS s FROM items GROUP BY grp HAVING c > 40;
SELECT grp, AVG(price) AS a FROM items GROUP BY grp HAVING a < 0 OR grp IS NULL;
SELECT DISTINCT grp FROM items;
SELECT DISTINCT TRIM(LOWER(name)) FROM items;
SELECT DISTINCT kind FROM events WHERE id < 150;
-- ordered
SELECT grp, COUNT(*) AS c FROM items GROUP BY grp ORDER BY c DESC, grp LIMIT 3;
-- ordered
SELECT kind, COUNT(*) AS n FROM events GROUP BY kind ORDER BY n, kind LIMIT 2;
-- ordered
SELECT grp, MAX(price) FROM items GROUP BY grp ORDER BY grp DESC;
-- ordered
SELECT TRIM(LOWER(name)) AS n, COUNT(*) AS c FROM items GROUP BY n ORDER BY c, n DESC LIMIT 2;

# What hscale cannot merge exactly runs on a copy of the table.
SELECT COUNT(DISTINCT grp) FROM items;
SELECT grp, COUNT(DISTINCT name), GROUP_CONCAT(DISTINCT id ORDER BY id) FROM items GROUP BY grp;

# ORDER BY an aggregate without LIMIT: hscale sorts every combined group.
-- ordered
SELECT grp, COUNT(*) AS c, SUM(price) FROM items GROUP BY grp ORDER BY c DESC, grp;
-- ordered
SELECT kind, at, COUNT(*) AS n FROM events GROUP BY kind, at ORDER BY n DESC, at, kind;

# Ranges of the partition column reach the partitions of their values.
SELECT * FROM events WHERE id BETWEEN 120 AND 180;
SELECT COUNT(*), MIN(id), MAX(id), MIN(at) FROM events WHERE id BETWEEN 150 AND 260;
SELECT id FROM events WHERE id BETWEEN 300 AND 100;
SELECT COUNT(*) FROM events WHERE id BETWEEN NULL AND 100;
-- ordered
SELECT id FROM events WHERE id BETWEEN 90 AND 960 ORDER BY id DESC LIMIT 5;
SELECT * FROM items WHERE id BETWEEN 7 AND 9;
SELECT SUM(price), COUNT(*) FROM items WHERE id BETWEEN '1' AND 200;
SELECT id FROM items WHERE id BETWEEN 10.5 AND 12;

# Expressions over aggregates: hscale combines the aggregates, then computes.
SELECT COUNT(*) + 1, SUM(price) * 2, MAX(price) - MIN(price), SUM(price) / COUNT(*), -SUM(qty) FROM items;
SELECT grp, SUM(price) / COUNT(price) AS mean, COUNT(*) * 100 / 200 FROM items GROUP BY grp;
SELECT grp, grp * COUNT(*), SUM(price) * 1.5e0, (MAX(id) - MIN(id)) * 2 FROM items GROUP BY grp;
SELECT grp, SUM(price) / COUNT(*) AS m FROM items GROUP BY grp HAVING m > 0;
SELECT COUNT(*) / 0, SUM(price) / SUM(price - price) FROM items;
-- ordered
SELECT kind, COUNT(*) / 3 AS third FROM events GROUP BY kind ORDER BY third DESC, kind LIMIT 2;
# Divisions inside, and AVG in, expressions over aggregates: on a copy.
SELECT 1 + SUM(price) / COUNT(*) FROM items;
SELECT AVG(price) * 2, SUM(price) DIV 7 FROM items;
