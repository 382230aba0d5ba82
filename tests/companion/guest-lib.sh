# Sourced by the guest scripts of tests/system/companion*.sh.
run() { # run NAME CMD...: one record
	local name=$1 out rc
	shift
	out=$("$@" 2>&1)
	rc=$?
	printf '@%s %s %s\n' "$name" "$rc" "$(printf '%s' "$out" | tr '\n' '|')"
}
