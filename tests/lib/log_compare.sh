# Sourced by the tests of several ranks (GPU and CPU): compares the log.csv files of two training runs.

# log_column FILE NAME: the number of column NAME in FILE's header.
log_column() { head -1 "$1" | tr , '\n' | grep -nx "$2" | cut -d: -f1; }

# compare_logs A B NAME FIRST LAST RTOL: column NAME of steps FIRST..LAST of log B within RTOL
# relative of log A's. Prints a summary; fails if a step is missing or outside.
compare_logs() {
    awk -F, -v col="$(log_column "$1" "$3")" -v first="$4" -v last="$5" -v rtol="$6" '
        BEGIN { at = first }
        NR == FNR { if (FNR > 1) want[$1] = $col; next }
        FNR > 1 && $1 >= first && $1 <= last {
            n++
            if (!($1 in want)) { bad++; next }
            d = $col - want[$1]; if (d < 0) d = -d; w = want[$1]; if (w < 0) w = -w
            rel = w > 0 ? d / w : d
            if (rel > worst) { worst = rel; at = $1 }
            if (!(d <= rtol * w)) bad++
        }
        END { printf "steps %d..%d: %d rows, %d outside %.0e, worst relative difference %.3g at step %d\n",
                     first, last, n, bad, rtol, worst, at
              exit (n == last - first + 1 && bad == 0) ? 0 : 1 }' "$1" "$2"
}

# same_columns DIR_A DIR_B: the two runs' log.csv have the same steps, train losses and gradient
# norms, bit for bit.
same_columns() { cmp -s <(cut -d, -f1,2,5 "$1/log.csv") <(cut -d, -f1,2,5 "$2/log.csv"); }
