# The host's half of the companion suites (tests/system/companion*.sh), sourced after
# tests/lib.sh. The guest scripts are the files of this directory; each guest run gets a copy
# of them, of the uapi header (for probe.c) in $share, mounted at /mnt/host. The guest prints
# one record per command, "@NAME RC OUTPUT" (output lines joined by |: guest-lib.sh), which
# the host reads back from the run's output file $share/FILE.out.
failed=0
fail() { failed=1; not_ok "$@"; }
share=$(mktemp -d)
trap 'rm -rf "$share"' EXIT
cp "$ROOT"/tests/companion/*.sh "$ROOT/tests/companion/probe.c" "$ROOT/include/uapi/peerdirect.h" "$share/"
# The probe, built once with the guest's gcc (in_trixie), for every guest of the suite; a
# guest builds it itself only if this failed (build_probe).
in_trixie "$share" 'gcc -Wall -Werror -o /tmp/probe probe.c && cp /tmp/probe probe' >"$share/probe.build" 2>&1

record() { sed -n "s/^@$1 //p" "$share/$2.out"; }
rc_of() { record "$1" "$2" | cut -d' ' -f1; }
out_of() { record "$1" "$2" | cut -d' ' -f2-; }
# expect DESCRIPTION FILE NAME RC PATTERN: the record's exit status and output
expect() {
	local desc=$1 file=$2 name=$3 rc=$4 pattern=$5
	if [ "$(rc_of "$name" "$file")" = "$rc" ] && out_of "$name" "$file" | grep -Eq -- "$pattern"; then
		ok "$desc"
	else
		fail "$desc" "$name: exit $(rc_of "$name" "$file"), output: $(out_of "$name" "$file")"
	fi
}
# guest_run FILE DESCRIPTION [qemu/run options] -- CMD...: runs the guest, its output into
# $share/FILE.out; a guest that does not end cleanly is a failure of its own.
guest_run() {
	local file=$1 desc=$2 r
	shift 2
	guest "$@" >"$share/$file.out" 2>"$share/$file.err"
	r=$?
	[ $r = 0 ] || fail "the guest run ($desc) ends cleanly" \
		"qemu/run exited $r (99: kernel splat, 98: guest died, 124: timeout)" \
		"$(cat "$share/$file.err")" "$(cat "$share/$file.out")"
}
