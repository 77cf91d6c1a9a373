# shellcheck shell=bash
# Sourced by the GPU tests of HellaSwag scoring (tests/gpu/test_gpu_model.sh against the CPU,
# tests/gpu/test_multi_gpu.sh 2 GPUs against 1): a small evaluation file's examples, and the
# comparison of two --hellaswag-dump files.

# hellaswag_examples_jsonl FILE: 7 examples in HellaSwag's jsonl form (prepare_data --hellaswag makes
# the evaluation file): plain English, Shakespeare, non-ASCII text, an empty ending, two equal endings.
# 7, an odd number, so that 2 ranks take 4 and 3 (eval/hellaswag.c's split).
hellaswag_examples_jsonl() {
    printf '%s\n' '{"ctx": "A man is sitting on a roof. he", "label": 3, "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "is holding a rubik'"'"'s cube.", "starts pulling up roofing on a roof."]}' \
        '{"ctx": "ROMEO: What say you, my lord? JULIET:", "label": 1, "endings": ["I say nothing.", "Good night, good night! Parting is such sweet sorrow.", "Wherefore art thou?", ""]}' \
        '{"ctx": "Le caf\u00e9 est ferm\u00e9; \u65e5\u672c\u8a9e", "label": 2, "endings": ["\ud83d\ude00 smiles", "na\u00efve", "r\u00e9sum\u00e9", "and so on"]}' \
        '{"ctx": "First Citizen: Before we proceed any further, hear me speak.", "label": 0, "endings": ["All: Speak, speak.", "You are all resolved rather to die than to famish?", "Resolved. resolved.", "We know it."]}' \
        '{"ctx": "The two twins are", "label": 1, "endings": ["exactly alike.", "the same.", "the same.", "different."]}' \
        '{"ctx": "KING HENRY: Once more unto the breach, dear friends,", "label": 2, "endings": ["once more;", "or close the wall up", "with our English dead.", "In peace there'"'"'s nothing so becomes a man"]}' \
        '{"ctx": "MENENIUS: What work'"'"'s, my countrymen, in hand? where go you", "label": 0, "endings": ["With bats and clubs?", "To the sea.", "Home, to bed.", "Nowhere at all."]}' \
        > "$1"
}

# hellaswag_dump_diff A B: for two --hellaswag-dump files of the same examples, prints the worst
# relative difference of B's ending scores from A's, the number of examples whose predicted ending
# differs, and the number of examples of each; fails where their examples are not the same.
hellaswag_dump_diff() {
    paste -d, "$1" "$2" | awk -F, 'NR > 1 {
        n++
        if ($2 != $10 || $3 != $11) mismatch = 1
        for (j = 5; j <= 8; j++) { d = ($(j + 8) - $j) / $j; if (d < 0) d = -d; if (d > w) w = d }
        if ($4 != $12) other++ } END { printf "%.3g %d %d\n", w, other, n; exit mismatch }'
}

# hellaswag_accuracy OUT: the accuracy line of a run's output, as "hellaswag 0.5000 (3/6)".
hellaswag_accuracy() { grep -o 'hellaswag [0-9.]* ([0-9/]*)' "$1" | head -1; }
