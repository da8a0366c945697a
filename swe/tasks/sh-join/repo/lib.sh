# join_by prints its arguments after the first joined by the first.
join_by() {
  local sep=$1 out=""
  shift
  for item in "$@"; do
    out+="$item$sep"
  done
  [ $# -le 1 ] && out=${out%"$sep"}
  echo "$out"
}
