#!/usr/bin/env bash
# The layer rules of cmake/layers.txt, checked on every #include "..." line of src/, engine/, tools/ and
# bench/ (run as a test, and by the build before the library's layers are compiled):
#   - a folder includes its own headers, the public include/, and the folders its rule allows, nothing else;
#   - no "../" in an include of src/ (another layer's header is "layer/header.h", found through the
#     layer's include root, so the compiler sees the same rules);
#   - no cycle between folders (a rule file that allowed one would be caught here too).
# Usage: tests/layers.sh [SOURCE_DIR]; exit 0 when the tree follows the rules, 1 with one line per problem.
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 1
rules=cmake/layers.txt
[ -r "$rules" ] || { echo "layers.sh: no $rules"; exit 1; }

declare -A allow=()
folders=()
while IFS= read -r line; do
    line=${line%%#*}
    [[ $line =~ ^([a-z/]+):(.*)$ ]] || continue
    folders+=("${BASH_REMATCH[1]}")
    allow[${BASH_REMATCH[1]}]=" ${BASH_REMATCH[2]} "
done <"$rules"

# every folder that exists must have a rule (a new src/ folder gets one before it builds)
for d in src/*/; do
    d=${d%/}
    [ -n "${allow[$d]+x}" ] || { echo "layers.sh: $d has no rule in $rules"; exit 1; }
done

# the folder of each header name (file names are unique across the tree)
declare -A home=()
for f in $(find "${folders[@]}" -maxdepth 1 -type f \( -name '*.h' -o -name '*.cuh' -o -name '*.c' \) 2>/dev/null); do
    home[$(basename "$f")]=$(dirname "$f")
done

fail=0
declare -A edge=()
for dir in "${folders[@]}"; do
    [ -d "$dir" ] || continue
    for f in "$dir"/*.c "$dir"/*.h "$dir"/*.cu "$dir"/*.cuh; do
        [ -f "$f" ] || continue
        n=0
        while IFS= read -r inc; do
            n=$((n + 1))
            [[ $inc =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]] || continue
            p=${BASH_REMATCH[1]}
            if [[ $dir == src/* && $p == *..* ]]; then
                echo "$f: #include \"$p\": no \"../\" in src/ (include another layer as \"layer/header.h\")"
                fail=1
                continue
            fi
            to=
            if [[ $p == */* && -f src/$p ]]; then
                to=src/${p%%/*}
            elif [[ $p != */* && -f $dir/$p ]]; then
                to=$dir
            elif [[ $p != */* && -f include/$p ]]; then
                to=include
            elif [[ $p != */* && -n ${home[$p]+x} ]]; then
                to=${home[$p]}
            elif [[ $dir != src/* && $p == ../* && -f $dir/$p ]]; then
                to=$(cd "$dir/$(dirname "$p")" && pwd)
                to=${to#"$root"/}
            else
                echo "$f: #include \"$p\": not found in $dir, include/ or a layer"
                fail=1
                continue
            fi
            [[ $to == "$dir" || $to == include ]] && continue
            edge["$dir $to"]=1
            if [[ ${allow[$dir]} != *" $to "* ]]; then
                echo "$f: #include \"$p\": $dir may not include $to (cmake/layers.txt: $dir:${allow[$dir]})"
                fail=1
            fi
        done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f")
    done
done

# cycles between folders, from the includes found (depth-first search, colour 1 = on the path)
declare -A colour=()
path=()
visit() {
    local u=$1 e v
    colour[$u]=1
    path+=("$u")
    for e in "${!edge[@]}"; do
        [[ ${e%% *} == "$u" ]] || continue
        v=${e#* }
        if [[ ${colour[$v]:-0} == 1 ]]; then
            local cyc="" i on=0
            for i in "${path[@]}"; do
                [[ $i == "$v" ]] && on=1
                ((on)) && cyc+="$i -> "
            done
            echo "layers.sh: include cycle: $cyc$v"
            fail=1
        elif [[ ${colour[$v]:-0} == 0 ]]; then
            visit "$v"
        fi
    done
    unset 'path[${#path[@]}-1]'
    colour[$u]=2
}
for dir in "${folders[@]}"; do
    [[ ${colour[$dir]:-0} == 0 ]] && visit "$dir"
done

if ((fail)); then
    echo "layers.sh: the tree breaks the layer rules (cmake/layers.txt)"
    exit 1
fi
n_edge=${#edge[@]}
echo "layers.sh: ${#folders[@]} folders, $n_edge dependencies between them, every include allowed, no cycle"
exit 0
