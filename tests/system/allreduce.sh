#!/usr/bin/env bash
# The two-host all-reduce (scripts/allreduce: the example userspace/peerdirect/examples/
# allreduce.rs in two linked guests) at small sizes, on both paths:
# - 4 ranks (2 per host): every rank's result right in the guests and, read out of the HBM
#   backing files, on the host; the direct path (tcp, FI_MR_DMABUF) copies nothing with the
#   CPU, the host-bounce path (verbs;ofi_rxm on rxe) copies exactly two copies of every byte
#   each rank sends and receives and says why it bounces; each rank registers its two buffers
#   once, in its first all-reduce, and every later request is a cache hit; the report's table
#   and plot are written; nothing is left on the host.
# - node1's QEMU killed mid-run: node0's rank fails within its timeout with an error that
#   names the peer and what to check, the run exits non-zero, and nothing is left behind.
. "$(dirname "$0")/../lib.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Plan: the run (1), its results (5 checks of the JSON, 1 on the host), the killed run (1) and
# what is left on the host (1).
plan 9
# scripts/allreduce boots its two guests side by side: what they need is built once, first.
prebuild || true

sizes=64K,1M iterations=3 ranks=4
run=$work/run
start=$(date +%s)
rc=0
"$ROOT/scripts/allreduce" --sizes $sizes --iterations $iterations \
	--ranks-per-host 2 --timeout 60 --out "$run" >"$work/out" 2>&1 || rc=$?
took=$(($(date +%s) - start))
if [ $rc = 0 ]; then
	ok "scripts/allreduce: 4 ranks on 2 hosts, both paths, every result right in the guests and on the host ($took s)"
	sed -n '/^all-reduce of float32/,/^paths taken/p' "$work/out" | sed 's/^/# /'
else
	not_ok "scripts/allreduce: 4 ranks on 2 hosts, both paths, every result right" "exit $rc" "$(tail -30 "$work/out")"
fi

direct=$run/node0/result-direct.json bounce=$run/node0/result-bounce.json
jq_true() { jq -e "$@" >/dev/null; }
# Every size of both paths: all ranks right, the path expected.
check "direct path: every rank's every element right at $sizes; every registration dma_buf (FI_MR_DMABUF)" \
	jq_true --argjson n $ranks '.ranks == $n and (.rows | length == 2) and all(.rows[]; .correct and .path == "dma_buf")
		and all(.per_rank[][]; .path == "dma_buf" and .correct)' "$direct"
check "host-bounce path: every rank's every element right; every registration host_bounce, with the provider's reason" \
	jq_true --argjson n $ranks '.ranks == $n and (.rows | length == 2) and all(.rows[]; .correct and .path == "host_bounce"
		and (.reason | test("fi_mr_regattr\\(FI_MR_DMABUF\\)")))' "$bounce"
# Bytes the library copied with the CPU: none on the direct path; on host bounce, every byte a
# rank sends (2 (n-1)/n of the size per all-reduce) copied once into staging and every byte it
# receives once out of it.
check "direct path: the library copied 0 bytes with the CPU (zero copy), at every size and rank" \
	jq_true 'all(.per_rank[][]; .cpu_copied_bytes == 0)' "$direct"
check "host-bounce path: each rank copied 2 x 2(n-1)/n x size bytes per all-reduce, no more, no less" \
	jq_true --argjson n $ranks 'all(.per_rank[][]; .cpu_copied_bytes == 2 * (2 * ($n - 1) * .size / $n) * .iterations)' "$bounce"
# The registration cache: two buffers per rank, registered in the first all-reduce; then hits.
check "registration cache: each rank registers its 2 buffers in its first all-reduce, then every request (2 per all-reduce) hits, on both paths" \
	jq_true -s --argjson it $iterations 'all(.[].per_rank[];
		.[0].registrations == 2 and .[0].hits == 2 * $it - 2
		and all(.[1:][]; .registrations == 0 and .hits == 2 * $it))' "$direct" "$bounce"
read -r checks failures _ <"$run/host-checks" 2>/dev/null || checks=0 failures=?
if [ "$checks" = $((2 * ranks)) ] && [ "$failures" = 0 ] &&
	grep -q '^host bounce because: ' "$run/report.txt" &&
	python3 -c 'import sys, xml.etree.ElementTree as t; r = t.parse(sys.argv[1]).getroot(); sys.exit(len(r.findall("{http://www.w3.org/2000/svg}polyline")) != 2)' "$run/allreduce.svg"; then
	ok "host: the last result of all $checks ranks (both paths) read out of the backing files is the sum; the report and its plot (two lines) are written"
else
	not_ok "host: every rank's result read out of the backing files; report and plot written" \
		"host checks: $checks, failures: $failures" "$(cat "$run"/host-check-* "$run/report.txt" 2>&1 | tail -20)"
fi

# A host dies mid-run: node1's QEMU is killed a few seconds into the direct path.
run=$work/kill
start=$(date +%s)
rc=0
"$ROOT/scripts/allreduce" --sizes 1M,4M --iterations 20 --timeout 20 \
	--kill-node1 2 --out "$run" --quiet >"$work/kill.out" 2>&1 || rc=$?
took=$(($(date +%s) - start))
err=$(cat "$run/node0/out-direct-0" 2>/dev/null | grep '^allreduce: rank 0: ' || true)
# node0's guest itself must end cleanly (its script exits 0 whatever its ranks did): a kernel
# splat, a death or a timeout there is no part of the expected failure. scripts/allreduce names
# both guests' qemu/run statuses when one is not 0 (node1's, killed, is not); no such line: both 0.
node0=$(sed -n 's/^qemu\/run exited \([0-9]*\) (node0) and .*/\1/p' "$work/kill.out" | tail -1)
node0=${node0:-0}
if [ $rc != 0 ] && [ "$(cat "$run/node0/rc-direct-0" 2>/dev/null)" = 1 ] && [ "$node0" = 0 ] &&
	grep -Eq 'rank 1: .*(no completion for 20 s during a transfer: the peer has died|sent nothing for .* within the timeout: it has died)' <<<"$err" &&
	[ $took -lt 300 ]; then
	ok "node1 killed mid-run: node0's rank 0 fails within its 20 s timeout and says so, the run exits $rc ($took s)"
	echo "# $err"
else
	not_ok "node1 killed mid-run: node0's rank 0 fails within its timeout and says so" \
		"exit $rc after $took s; node0 rank 0 exit $(cat "$run/node0/rc-direct-0" 2>/dev/null || echo none); node0's qemu/run exited ${node0:-?} (99: kernel splat, 98: guest died, 124: timeout)" \
		"$err" "$(tail -20 "$work/kill.out")"
fi

# Nothing of either run is left: no QEMU on their link ports, none of their backing files
# (named by the runs themselves: other suites' guests come and go meanwhile).
left= files= named=0
for run in "$work/run" "$work/kill"; do
	read -r p0 p1 <"$run/link-ports" || continue
	left+=$(grep -laE "local.port=($p0|$p1)," /proc/[0-9]*/cmdline 2>/dev/null || true)
	for f in $(cat "$run/backings" 2>/dev/null); do
		named=$((named + 1))
		[ ! -e "$f" ] || files+=" $f"
	done
done
if [ -z "$left" ] && [ -z "$files" ] && [ $named = 4 ]; then
	ok "nothing is left on the host after either run: no QEMU process, none of the 4 HBM backing files"
else
	not_ok "nothing is left on the host after either run" "processes: $left" "backing files left:$files (of $named named)"
fi
