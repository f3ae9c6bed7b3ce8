#!/bin/sh
# Hugging Face's tokenizers and unicodedata2 16.0.0 (PyPI) into build/pylib for the optional
# tokenizer reference test (tests/tokenizer_ref.py) and the Unicode 16 checks (tests/unicode.sh),
# where Debian's python3 has pip and PyPI answers; otherwise a note and exit 0: those tests are then
# skipped. Nothing is installed outside build/.
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3) || exit 0
have='import tokenizers, unicodedata2; assert unicodedata2.unidata_version == "16.0.0"'
PYTHONPATH=build/pylib "$py" -c "$have" >/dev/null 2>&1 && exit 0
# tried once already (offline): not again on every make test; rm -r build/pylib to try again
[ -f build/pylib/.tried ] && exit 0
mkdir -p build/pylib && : > build/pylib/.tried
if "$py" -m pip --version >/dev/null 2>&1 &&
   timeout 300 "$py" -m pip install -q --no-deps --disable-pip-version-check --retries 1 \
       --timeout 20 --target build/pylib tokenizers unicodedata2==16.0.0 >/dev/null 2>&1 &&
   PYTHONPATH=build/pylib "$py" -c "$have" >/dev/null 2>&1; then
    echo "deps: tokenizers and unicodedata2 installed in build/pylib (the tokenizer reference test)"
else
    echo "deps: note: tokenizers and unicodedata2 could not be installed from PyPI (no pip or no" \
         "network): the tokenizer reference test and the Unicode 16 checks will be skipped"
fi
exit 0
