// The driver matrix for a JDBC driver with its default options (MySQL
// Connector/J, MariaDB Connector/J); the bound-parameter step runs twice:
// as the driver binds by default, and with useServerPrepStmts=true, which
// both offer. Usage: java -cp DRIVER.jar Matrix.java URL TABLE, URL without
// options.
import java.sql.*;
import java.util.*;

public class Matrix {
    public static void main(String[] args) throws Exception {
        String url = args[0], table = args[1];
        String insert = "INSERT INTO " + table + " VALUES (?, ?, ?)";
        try (Connection conn = DriverManager.getConnection(url, "root", "");
             Connection server = DriverManager.getConnection(url + "?useServerPrepStmts=true", "root", "");
             Statement st = conn.createStatement()) {
            // A multi-row INSERT over both backends, autocommitted.
            st.executeUpdate("INSERT INTO " + table + " VALUES (1, 'a', 10), (2, 'b', 20)");
            // A transaction over both, committed through the driver's API.
            conn.setAutoCommit(false);
            st.executeUpdate("INSERT INTO " + table + " VALUES (3, 'c', 30)");
            st.executeUpdate("INSERT INTO " + table + " VALUES (4, 'd', 40)");
            conn.commit();
            // The same with bound parameters, bound by default, then prepared on the server.
            insertTwo(conn, insert, 5, 6);
            conn.commit();
            server.setAutoCommit(false);
            insertTwo(server, insert, 15, 16);
            server.commit();
            // One rolled back.
            insertTwo(conn, insert, 7, 8);
            conn.rollback();
            // A duplicate key on the second backend inside a transaction.
            insertTwo(conn, insert, 9, 10);
            try (PreparedStatement ps = conn.prepareStatement(insert)) {
                ps.setInt(1, 1); ps.setString(2, "dup"); ps.setInt(3, 0);
                ps.executeUpdate();
                throw new AssertionError("the duplicate key was accepted");
            } catch (SQLException e) {
                if (e.getErrorCode() != 1062) throw e;
            }
            conn.rollback();
            // SAVEPOINT and ROLLBACK TO over both backends, through the API.
            insertTwo(conn, insert, 11, 12);
            Savepoint s = conn.setSavepoint("s");
            insertTwo(conn, insert, 13, 14);
            conn.rollback(s);
            conn.commit();
            conn.setAutoCommit(true);
            // Read back.
            List<Integer> ids = new ArrayList<>();
            try (ResultSet rs = st.executeQuery("SELECT id FROM " + table + " ORDER BY id")) {
                while (rs.next()) ids.add(rs.getInt(1));
            }
            List<Integer> want = List.of(1, 2, 3, 4, 5, 6, 11, 12, 15, 16);
            if (!ids.equals(want)) throw new AssertionError("read back " + ids + ", want " + want);
            try (ResultSet rs = st.executeQuery("XA RECOVER")) {
                if (rs.next()) throw new AssertionError("XA RECOVER lists a branch");
            }
            StringJoiner out = new StringJoiner(" ");
            ids.forEach(i -> out.add(i.toString()));
            System.out.println(out);
        }
    }

    static void insertTwo(Connection conn, String insert, int a, int b) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(insert)) {
            for (int id : new int[] {a, b}) {
                ps.setInt(1, id);
                ps.setString(2, "r" + id);
                ps.setInt(3, id * 10);
                ps.executeUpdate();
            }
        }
    }
}
