# Sourced by run.sh: matrix_table NAME makes `drivers`.NAME through hscale,
# partitioned by MOD(2) of id, odd ids on backend 2; matrix_check NAME IDS
# checks on the backends directly that each id is where it routes, once,
# and that neither backend has a prepared XA branch left.
matrix_table() {
  mariadb -h127.0.0.1 -P"$PORT" -uroot drivers -e "
    CREATE TABLE $1 (id INT PRIMARY KEY, owner VARCHAR(20), amount INT);
    HSCALE SETUP_TABLE('$1', 'id', '${1}_default', 1, 'MOD(2)');
    HSCALE ADD_PARTITION('$1', 'odd', 1, 2);"
}

matrix_check() {
  local name=$1 ids=$2 even odd
  even=$(tr ' ' '\n' <<<"$ids" | awk '$1 % 2 == 0' | paste -sd' ')
  odd=$(tr ' ' '\n' <<<"$ids" | awk '$1 % 2 == 1' | paste -sd' ')
  local on1 on2
  on1=$(mariadb -h127.0.0.1 -P"$BACKEND1" -uroot -N drivers -e "SELECT GROUP_CONCAT(id ORDER BY id SEPARATOR ' ') FROM ${name}_default")
  on2=$(mariadb -h127.0.0.1 -P"$BACKEND2" -uroot -N drivers -e "SELECT GROUP_CONCAT(id ORDER BY id SEPARATOR ' ') FROM ${name}_odd")
  [ "$on1" = "$even" ] || { echo "$name: backend 1 holds '$on1', expected '$even'"; return 1; }
  [ "$on2" = "$odd" ] || { echo "$name: backend 2 holds '$on2', expected '$odd'"; return 1; }
  for port in "$BACKEND1" "$BACKEND2"; do
    [ -z "$(mariadb -h127.0.0.1 -P"$port" -uroot -N -e 'XA RECOVER')" ] || { echo "$name: a branch is left on port $port"; return 1; }
  done
}
