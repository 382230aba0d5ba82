#!/usr/bin/env bash
# The two-host all-reduce (scripts/allreduce: the example userspace/peerdirect/examples/
# allreduce.rs in two linked guests) at small sizes, on its three paths:
# - 4 ranks (2 per host): every rank's result right in the guests and, read out of the HBM
#   backing files, on the host, on each path; tcp (FI_MR_DMABUF) and verbs direct (verbs;ofi_rxm
#   with FI_MR_DMABUF on the test kernel's patched rxe: ibv_reg_dmabuf_mr, ib_core's dma-buf
#   import) register every buffer dma_buf and the library copies nothing with the CPU; verbs
#   host bounce (verbs;ofi_rxm on Debian's stock kernel and rxe, a second pair of guests)
#   registers every buffer host_bounce with the provider's reason and copies exactly two copies
#   of every byte each rank sends and receives; each rank registers its two buffers once, in its
#   first all-reduce, and every later request is a cache hit; the report's table (a line per
#   path) and plot (three lines) are written; nothing is left on the host.
# - node1's QEMU killed mid-run (tcp only): node0's rank fails within its timeout with an error
#   that names the peer and what to check, the run exits non-zero, and nothing is left behind.
. "$(dirname "$0")/../lib.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Plan: the run (1), its results (7 checks of the JSON, 1 on the host), the killed run (1) and
# what is left on the host (1). scripts/allreduce builds what its guests need itself, once.
plan 11

sizes=64K,1M iterations=3 ranks=4
run=$work/run
start=$(date +%s)
rc=0
"$ROOT/scripts/allreduce" --sizes $sizes --iterations $iterations \
	--ranks-per-host 2 --timeout 60 --out "$run" >"$work/out" 2>&1 || rc=$?
took=$(($(date +%s) - start))
if [ $rc = 0 ]; then
	ok "scripts/allreduce: 4 ranks on 2 hosts, three paths (tcp, verbs direct, verbs host bounce), every result right in the guests and on the host ($took s)"
	sed -n '/^all-reduce of float32/,/^What the numbers/p' "$work/out" | sed -e '$d' -e 's/^/# /'
else
	not_ok "scripts/allreduce: 4 ranks on 2 hosts, three paths, every result right" "exit $rc" "$(tail -30 "$work/out")"
fi

tcp=$run/result-tcp.json verbs=$run/result-verbs-direct.json bounce=$run/result-host-bounce.json
jq_true() { jq -e "$@" >/dev/null; }
# Every size of a path: all ranks right, each rank's two registrations (data and scratch) on
# the path expected.
# registered PATH FILE [REASON]: every row and every rank's record right, both buffers
# registered on PATH, with a reason matching REASON (else none); on failure, what was seen.
registered() {
	jq_true --argjson n $ranks --arg p "$1" --arg why "${3-}" '.ranks == $n and (.rows | length == 2)
		and all(.rows[]; .correct and .path == $p
			and (if $why == "" then .reason == null else (.reason | test($why)) end))
		and (.per_rank | length == $n)
		and all(.per_rank[][]; .correct and .path == $p and .paths.data == $p and .paths.scratch == $p)' "$2" ||
		{ jq -c '.rows[] | {size, correct, path, reason}' "$2" 2>&1 | sed 's/^/# seen: /'; false; }
}
check "tcp: every rank's every element right at $sizes; both buffers of every rank registered dma_buf (FI_MR_DMABUF)" \
	registered dma_buf "$tcp"
check "verbs direct (verbs;ofi_rxm, the test kernel's patched rxe): every rank's every element right; both buffers of every rank registered dma_buf (FI_MR_DMABUF)" \
	registered dma_buf "$verbs"
check "verbs host bounce (verbs;ofi_rxm, Debian's kernel and rxe): every rank's every element right; both buffers of every rank registered host_bounce, with the provider's reason" \
	registered host_bounce "$bounce" '^verbs;ofi_rxm: fi_mr_regattr\(FI_MR_DMABUF\): Operation not supported'
# Bytes the library copied with the CPU: none on the direct paths; on host bounce, every byte a
# rank sends (2 (n-1)/n of the size per all-reduce) copied once into staging and every byte it
# receives once out of it.
check "tcp: the library copied 0 bytes with the CPU (zero copy), at every size and rank" \
	jq_true 'all(.per_rank[][]; .cpu_copied_bytes == 0)' "$tcp"
check "verbs direct: the library copied 0 bytes with the CPU (zero copy), at every size and rank" \
	jq_true 'all(.per_rank[][]; .cpu_copied_bytes == 0)' "$verbs"
check "verbs host bounce: each rank copied 2 x 2(n-1)/n x size bytes per all-reduce, no more, no less" \
	jq_true --argjson n $ranks 'all(.per_rank[][]; .cpu_copied_bytes == 2 * (2 * ($n - 1) * .size / $n) * .iterations)' "$bounce"
# The registration cache: two buffers per rank, registered in the first all-reduce; then hits.
check "registration cache: each rank registers its 2 buffers in its first all-reduce, then every request (2 per all-reduce) hits, on all three paths" \
	jq_true -s --argjson it $iterations --argjson n $ranks 'length == 3 and all(.[].per_rank; length == $n) and all(.[].per_rank[];
		.[0].registrations == 2 and .[0].hits == 2 * $it - 2
		and all(.[1:][]; .registrations == 0 and .hits == 2 * $it))' "$tcp" "$verbs" "$bounce"
read -r checks failures _ <"$run/host-checks" 2>/dev/null || checks=0 failures=?
if [ "$checks" = $((3 * ranks)) ] && [ "$failures" = 0 ] &&
	grep -q '^tcp  *tcp on the test kernel: ' "$run/report.txt" &&
	grep -q "^verbs direct  *verbs;ofi_rxm on the test kernel's patched rxe: " "$run/report.txt" &&
	grep -q "^verbs host bounce  *verbs;ofi_rxm on Debian's kernel and rxe: " "$run/report.txt" &&
	grep -q '^  *host bounce because: ' "$run/report.txt" &&
	python3 -c 'import sys, xml.etree.ElementTree as t; r = t.parse(sys.argv[1]).getroot(); sys.exit(len(r.findall("{http://www.w3.org/2000/svg}polyline")) != 3)' "$run/allreduce.svg"; then
	ok "host: the last result of all $checks ranks (4 per path) read out of the backing files is the sum; the report (a line per path) and its plot (three lines) are written"
else
	not_ok "host: every rank's result on every path read out of the backing files; report and plot written" \
		"host checks: $checks, failures: $failures" "$(cat "$run"/host-check-* "$run/report.txt" 2>&1 | tail -30)"
fi

# A host dies mid-run: node1's QEMU is killed a few seconds into the tcp path.
run=$work/kill
start=$(date +%s)
rc=0
"$ROOT/scripts/allreduce" --sizes 1M,4M --iterations 20 --timeout 20 --paths tcp \
	--kill-node1 2 --out "$run" --quiet >"$work/kill.out" 2>&1 || rc=$?
took=$(($(date +%s) - start))
node0_dir=$run/test-kernel/node0
err=$(cat "$node0_dir/out-tcp-0" 2>/dev/null | grep '^allreduce: rank 0: ' || true)
# node0's guest itself must end cleanly (its script exits 0 whatever its ranks did): a kernel
# splat, a death or a timeout there is no part of the expected failure. scripts/allreduce names
# both guests' qemu/run statuses when one is not 0 (node1's, killed, is not); no such line: both 0.
node0=$(sed -n 's/^test-kernel pair: qemu\/run exited \([0-9]*\) (node0) and .*/\1/p' "$work/kill.out" | tail -1)
node0=${node0:-0}
if [ $rc != 0 ] && [ "$(cat "$node0_dir/rc-tcp-0" 2>/dev/null)" = 1 ] && [ "$node0" = 0 ] &&
	grep -Eq 'rank 1: .*(no completion for 20 s during a transfer: the peer has died|sent nothing for .* within the timeout: it has died)' <<<"$err" &&
	[ $took -lt 300 ]; then
	ok "node1 killed mid-run: node0's rank 0 fails within its 20 s timeout and says so, the run exits $rc ($took s)"
	echo "# $err"
else
	not_ok "node1 killed mid-run: node0's rank 0 fails within its timeout and says so" \
		"exit $rc after $took s; node0 rank 0 exit $(cat "$node0_dir/rc-tcp-0" 2>/dev/null || echo none); node0's qemu/run exited ${node0:-?} (99: kernel splat, 98: guest died, 124: timeout)" \
		"$err" "$(tail -20 "$work/kill.out")"
fi

# Nothing of either run is left: no QEMU on their link ports (a line per pair of guests), none
# of their backing files (named by the runs themselves: other suites' guests come and go
# meanwhile): 4 of the first run's two pairs, 2 of the killed run's one.
left= files= named=0
for run in "$work/run" "$work/kill"; do
	[ -e "$run/link-ports" ] || continue
	while read -r p0 p1; do
		left+=$(grep -laE "local.port=($p0|$p1)," /proc/[0-9]*/cmdline 2>/dev/null || true)
	done <"$run/link-ports"
	for f in $(cat "$run/backings" 2>/dev/null); do
		named=$((named + 1))
		[ ! -e "$f" ] || files+=" $f"
	done
done
if [ -z "$left" ] && [ -z "$files" ] && [ $named = 6 ] && [ "$(cat "$work/run/link-ports" "$work/kill/link-ports" | wc -l)" = 3 ]; then
	ok "nothing is left on the host after either run: no QEMU process of their 3 pairs of guests, none of the 6 HBM backing files"
else
	not_ok "nothing is left on the host after either run" "processes: $left" "backing files left:$files (of $named named)"
fi
