# bash completion for nas, installed by `make install` as
# <prefix>/share/bash-completion/completions/nas.
# Commands and their options come from nas's own --help (so they follow the binary being
# completed), experiment names from the first column of `nas status --format csv` (cheap:
# no fronts worked out) of the storage the command line names with --storage, else
# $NAS_STORAGE, else sqlite:nas.db.

# The experiments of the storage the words name; $1 is the nas being completed.
_nas_experiments() {
  local nas=$1 storage=() i
  for ((i = 1; i < ${#COMP_WORDS[@]} - 1; i++)); do
    [[ ${COMP_WORDS[i]} == --storage ]] && storage=(--storage "${COMP_WORDS[i + 1]}")
  done
  "$nas" status --format csv "${storage[@]}" 2>/dev/null | sed '1d; s/,.*//'
}

_nas() {
  local nas=${COMP_WORDS[0]} cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]}
  local cmd=${COMP_WORDS[1]} usage arg i w p
  COMPREPLY=()
  if ((COMP_CWORD == 1)); then
    mapfile -t COMPREPLY < <(compgen -W "$("$nas" --help 2>/dev/null |
      sed -n 's/^  \([a-z][a-z-]*\)  .*/\1/p') --help --version" -- "$cur")
    return
  fi
  usage=$("$nas" "$cmd" --help 2>/dev/null | sed -n '1,/^$/p')
  case $prev in
    --experiment) mapfile -t COMPREPLY < <(compgen -W "$(_nas_experiments "$nas")" -- "$cur"); return ;;
    --format) mapfile -t COMPREPLY < <(compgen -W "table csv json" -- "$cur"); return ;;
    --*) # an option whose value is a FILE or DIR completes paths; other values, nothing
      if [[ $usage == *"$prev FILE"* || $usage == *"$prev DIR"* ]]; then
        mapfile -t COMPREPLY < <(compgen -f -- "$cur")
      elif [[ $usage == *"$prev "[A-Z]* ]]; then
        return
      fi ;;
  esac
  if [[ $cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$(grep -o -- '--[a-z][a-z-]*' <<<"$usage" | sort -u) --help" -- "$cur")
    return
  fi
  # The first argument after the command: what the usage line names there.
  for ((i = 2; i < COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]} p=${COMP_WORDS[i - 1]}
    [[ $w == -* || ($p == -* && $usage == *"$p "[A-Z]*) ]] || return
  done
  arg=$(sed -n "1s/^usage: nas $cmd \([^ ]*\).*/\1/p" <<<"$usage")
  case $arg in
    EXPERIMENT | "[EXPERIMENT]") mapfile -t COMPREPLY < <(compgen -W "$(_nas_experiments "$nas")" -- "$cur") ;;
    FILE) mapfile -t COMPREPLY < <(compgen -f -X '!*.y*ml' -- "$cur"; compgen -d -- "$cur") ;;
  esac
}
complete -o filenames -F _nas nas
