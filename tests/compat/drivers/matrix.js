// The driver matrix for mysql2 (Node) with its default options: query() binds
// on the client, execute() prepares on the server. Usage: node matrix.js PORT
// DATABASE TABLE.
const mysql = require('mysql2/promise');

async function main() {
  const [port, database, table] = process.argv.slice(2);
  const conn = await mysql.createConnection({ host: '127.0.0.1', port: Number(port), user: 'root', database });
  const insert = `INSERT INTO ${table} VALUES (?, ?, ?)`;

  // A multi-row INSERT over both backends, autocommitted.
  await conn.query(`INSERT INTO ${table} VALUES (1, 'a', 10), (2, 'b', 20)`);
  // A transaction over both, committed through the driver's API.
  await conn.beginTransaction();
  await conn.query(insert, [3, 'c', 30]);
  await conn.query(insert, [4, 'd', 40]);
  await conn.commit();
  // The same prepared on the server.
  await conn.beginTransaction();
  await conn.execute(insert, [5, 'e', 50]);
  await conn.execute(insert, [6, 'f', 60]);
  await conn.commit();
  // One rolled back.
  await conn.beginTransaction();
  await conn.execute(insert, [7, 'g', 70]);
  await conn.query(insert, [8, 'h', 80]);
  await conn.rollback();
  // A duplicate key on the second backend inside a transaction.
  await conn.beginTransaction();
  await conn.execute(insert, [9, 'i', 90]);
  await conn.execute(insert, [10, 'j', 100]);
  try {
    await conn.execute(insert, [1, 'dup', 0]);
    throw new Error('the duplicate key was accepted');
  } catch (e) {
    if (e.errno !== 1062) throw e;
  }
  await conn.rollback();
  // SAVEPOINT and ROLLBACK TO over both backends.
  await conn.beginTransaction();
  await conn.execute(insert, [11, 'k', 110]);
  await conn.execute(insert, [12, 'l', 120]);
  await conn.query('SAVEPOINT s');
  await conn.execute(insert, [13, 'm', 130]);
  await conn.execute(insert, [14, 'n', 140]);
  await conn.query('ROLLBACK TO SAVEPOINT s');
  await conn.commit();
  // Read back.
  const [rows] = await conn.query(`SELECT id FROM ${table} ORDER BY id`);
  const ids = rows.map((r) => r.id);
  const want = [1, 2, 3, 4, 5, 6, 11, 12];
  if (JSON.stringify(ids) !== JSON.stringify(want)) throw new Error(`read back ${ids}, want ${want}`);
  const [xa] = await conn.query('XA RECOVER');
  if (xa.length !== 0) throw new Error('XA RECOVER lists a branch');
  await conn.end();
  console.log(ids.join(' '));
}

main().catch((e) => { console.error(e); process.exit(1); });
