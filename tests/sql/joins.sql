# Joins of co-located tables (partitioned alike, joined on their partition
# columns) run partition by partition; other joins of partitioned tables run
# on copies of them.

-- partition customers id MOD(4) 1 2 3
-- partition orders customer_id MOD(4) 1 2 3
-- partition payments customer_id MOD(4) 1 2

CREATE TABLE customers (id INT PRIMARY KEY, name VARCHAR(20), region VARCHAR(10));
INSERT INTO customers
  SELECT seq, CONCAT('customer ', seq), ELT(1 + seq % 3, 'north', 'South', 'east')
  FROM seq_1_to_60;

# Every fifth customer has no orders.
CREATE TABLE orders (id INT PRIMARY KEY, customer_id INT, amount DECIMAL(10,2), placed DATE);
INSERT INTO orders
  SELECT seq, 1 + seq % 60, (seq * 131 % 997) / 4, '2024-01-01' + INTERVAL seq % 90 DAY
  FROM seq_1_to_300
  WHERE (1 + seq % 60) % 5 <> 0;

CREATE TABLE payments (id INT PRIMARY KEY, customer_id INT, paid DECIMAL(10,2));
INSERT INTO payments SELECT seq, 1 + seq % 60, seq FROM seq_1_to_50;

CREATE TABLE regions (name VARCHAR(10) PRIMARY KEY, manager VARCHAR(20));
INSERT INTO regions VALUES ('north', 'ann'), ('south', 'bob'), ('east', 'cy');

-- queries

SELECT c.id, c.name, o.id, o.amount FROM customers c JOIN orders o ON o.customer_id = c.id;
SELECT c.name, o.amount FROM customers c JOIN orders o ON o.customer_id = c.id WHERE c.id = 7;
SELECT c.name, o.id FROM customers c, orders o WHERE o.customer_id = c.id AND o.customer_id IN (1, 2, 10);
SELECT customers.name, orders.amount FROM customers JOIN orders ON customers.id = orders.customer_id WHERE orders.amount > 200;
SELECT c.id, o.id FROM customers c LEFT JOIN orders o ON o.customer_id = c.id;
SELECT c.id FROM customers c LEFT JOIN orders o ON o.customer_id = c.id WHERE o.id IS NULL;
SELECT o.id, c.name FROM orders o RIGHT JOIN customers c ON c.id = o.customer_id WHERE c.id < 12;
SELECT a.id, b.id FROM orders a JOIN orders b ON a.customer_id = b.customer_id AND a.id < b.id WHERE a.customer_id < 5;
SELECT c.region, COUNT(*), SUM(o.amount), AVG(o.amount), MAX(o.placed) FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.region;
SELECT COUNT(*), SUM(o.amount) FROM customers c JOIN orders o ON o.customer_id = c.id;
SELECT c.id, COUNT(o.id) AS n FROM customers c LEFT JOIN orders o ON o.customer_id = c.id GROUP BY c.id HAVING n > 5;
SELECT DISTINCT c.region FROM customers c JOIN orders o ON o.customer_id = c.id WHERE o.amount > 240;
-- ordered
SELECT o.id, o.amount, c.name FROM customers c JOIN orders o ON o.customer_id = c.id ORDER BY o.amount DESC, o.id LIMIT 5;
-- ordered
SELECT c.id, SUM(o.amount) AS total FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.id ORDER BY total DESC, c.id LIMIT 4;
-- ordered
SELECT c.name, o.placed FROM customers c JOIN orders o ON c.id = o.customer_id ORDER BY o.placed, o.id LIMIT 10 OFFSET 100;

# Joins hscale cannot run partition by partition: answered from copies of
# the tables on the main backend.
SELECT * FROM customers c JOIN orders o ON o.id = c.id;
SELECT * FROM customers c JOIN orders o ON o.customer_id = c.id OR o.id = c.id;
SELECT * FROM customers c JOIN payments p ON p.customer_id = c.id;
SELECT * FROM customers WHERE id IN (SELECT customer_id FROM orders);
SELECT c.name, r.manager FROM customers c JOIN regions r ON r.name = c.region;
SELECT c.name, COUNT(DISTINCT p.paid) FROM customers c LEFT JOIN payments p ON p.customer_id = c.id GROUP BY c.name;
# A locking read cannot lock copies.
-- error 1235
SELECT * FROM customers c JOIN orders o ON o.id = c.id FOR UPDATE;
SELECT c.id, o.amount FROM customers c JOIN orders o ON o.customer_id = c.id WHERE c.id BETWEEN 5 AND 7;

# Subqueries correlated on the partition column of a co-located table run
# inside each partition.
SELECT c.id, c.name FROM customers c WHERE EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.id AND o.amount > 200);
SELECT c.id FROM customers c WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.id);
SELECT c.id, (SELECT COUNT(*) FROM orders o WHERE o.customer_id = c.id) AS n, (SELECT MAX(o.amount) FROM orders o WHERE o.customer_id = c.id) AS top FROM customers c;
SELECT o.id FROM orders o WHERE o.amount = (SELECT MAX(x.amount) FROM orders x WHERE x.customer_id = o.customer_id);
SELECT c.id FROM customers c WHERE c.id = 7 AND c.id IN (SELECT o.customer_id FROM orders o WHERE o.customer_id = c.id);
SELECT c.id FROM customers c WHERE c.region = 'north' AND 3 < (SELECT COUNT(*) FROM orders o WHERE o.customer_id = c.id AND o.amount > 50);
SELECT COUNT(*), SUM(c.id) FROM customers c WHERE EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.id);
-- ordered
SELECT c.id, (SELECT SUM(o.amount) FROM orders o WHERE o.customer_id = c.id) AS total FROM customers c ORDER BY total DESC, c.id LIMIT 5;
# Correlated with a table that is not co-located, or on another column:
# answered from copies.
SELECT COUNT(*) FROM customers c WHERE EXISTS (SELECT 1 FROM payments p WHERE p.customer_id = c.id);
SELECT c.id FROM customers c WHERE EXISTS (SELECT 1 FROM orders o WHERE o.id = c.id);
SELECT (SELECT SUM(c.id) FROM orders o WHERE o.customer_id = c.id LIMIT 1) FROM customers c;
