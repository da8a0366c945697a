# abs prints the absolute value of the integer $1.
abs() {
  echo "$1"
}
