// The driver matrix for go-sql-driver/mysql with its default options
// (server-side prepared statements for arguments: interpolateParams is off).
// Usage: go run matrix.go PORT DATABASE TABLE.
package main

import (
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"sort"
	"strings"

	"github.com/go-sql-driver/mysql"
)

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

func main() {
	port, database, table := os.Args[1], os.Args[2], os.Args[3]
	db, err := sql.Open("mysql", fmt.Sprintf("root@tcp(127.0.0.1:%s)/%s", port, database))
	must(err)
	defer db.Close()
	insert := fmt.Sprintf("INSERT INTO %s VALUES (?, ?, ?)", table)

	// A multi-row INSERT over both backends, autocommitted.
	_, err = db.Exec(fmt.Sprintf("INSERT INTO %s VALUES (1, 'a', 10), (2, 'b', 20)", table))
	must(err)
	// A transaction over both, committed through the driver's API.
	tx, err := db.Begin()
	must(err)
	_, err = tx.Exec(fmt.Sprintf("INSERT INTO %s VALUES (3, 'c', 30)", table))
	must(err)
	_, err = tx.Exec(fmt.Sprintf("INSERT INTO %s VALUES (4, 'd', 40)", table))
	must(err)
	must(tx.Commit())
	// The same with bound parameters: prepared on the server.
	tx, err = db.Begin()
	must(err)
	_, err = tx.Exec(insert, 5, "e", 50)
	must(err)
	_, err = tx.Exec(insert, 6, "f", 60)
	must(err)
	must(tx.Commit())
	// One rolled back.
	tx, err = db.Begin()
	must(err)
	_, err = tx.Exec(insert, 7, "g", 70)
	must(err)
	_, err = tx.Exec(insert, 8, "h", 80)
	must(err)
	must(tx.Rollback())
	// A duplicate key on the second backend inside a transaction: the
	// whole transaction rolled back.
	tx, err = db.Begin()
	must(err)
	_, err = tx.Exec(insert, 9, "i", 90)
	must(err)
	_, err = tx.Exec(insert, 10, "j", 100)
	must(err)
	_, err = tx.Exec(insert, 1, "dup", 0)
	var mysqlErr *mysql.MySQLError
	if !errors.As(err, &mysqlErr) || mysqlErr.Number != 1062 {
		log.Fatalf("expected 1062, got %v", err)
	}
	must(tx.Rollback())
	// SAVEPOINT and ROLLBACK TO over both backends.
	tx, err = db.Begin()
	must(err)
	for _, step := range []struct {
		sql  string
		args []any
	}{
		{insert, []any{11, "k", 110}},
		{insert, []any{12, "l", 120}},
		{"SAVEPOINT s", nil},
		{insert, []any{13, "m", 130}},
		{insert, []any{14, "n", 140}},
		{"ROLLBACK TO SAVEPOINT s", nil},
	} {
		_, err = tx.Exec(step.sql, step.args...)
		must(err)
	}
	must(tx.Commit())
	// Read back.
	rows, err := db.Query(fmt.Sprintf("SELECT id FROM %s ORDER BY id", table))
	must(err)
	var ids []string
	var got []int
	for rows.Next() {
		var id int
		must(rows.Scan(&id))
		got = append(got, id)
		ids = append(ids, fmt.Sprint(id))
	}
	must(rows.Err())
	want := []int{1, 2, 3, 4, 5, 6, 11, 12}
	if !sort.IntsAreSorted(got) || fmt.Sprint(got) != fmt.Sprint(want) {
		log.Fatalf("read back %v, want %v", got, want)
	}
	xa, err := db.Query("XA RECOVER")
	must(err)
	if xa.Next() {
		log.Fatal("XA RECOVER lists a branch")
	}
	must(xa.Close())
	fmt.Println(strings.Join(ids, " "))
}
