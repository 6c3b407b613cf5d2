#!/usr/bin/env bash
# Grafana's own dashboard schema as JSON Schema, for tests/test_dashboards_schema.py:
#   npm @grafana/schema (the TypeScript types Grafana generates from its CUE schemas) and
#   ts-json-schema-generator turn dist/types/raw/dashboard/x/types.gen.d.ts (type Dashboard)
#   and the panel-config types of the panels we use into .tools/grafana-schema/*.json,
#   twice: "strict" (no additional properties, the generator's default) and "open".
# Everything is pinned and installed into .tools/node; nothing third-party is committed.
# Idempotent: does nothing when the schemas for these versions are already there.
set -euo pipefail
cd "$(dirname "$0")/.."
GRAFANA_SCHEMA_VERSION="13.2.3"
GENERATOR_VERSION="2.4.0"
TYPESCRIPT_VERSION="5.8.3"
NODE_DIR="$PWD/.tools/node"
OUT="$PWD/.tools/grafana-schema"
STAMP="$OUT/.versions"
WANT="@grafana/schema@$GRAFANA_SCHEMA_VERSION ts-json-schema-generator@$GENERATOR_VERSION typescript@$TYPESCRIPT_VERSION"
PANELS="timeseries table stat histogram piechart"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "install-grafana-schema: npm is needed (Debian package npm)" >&2; exit 1; }
echo "install-grafana-schema: $WANT" >&2
mkdir -p "$NODE_DIR"
[ -f "$NODE_DIR/package.json" ] || printf '{"name": "oomsight-tools", "private": true}\n' >"$NODE_DIR/package.json"
# shellcheck disable=SC2086
npm install --prefix "$NODE_DIR" --silent --no-audit --no-fund --ignore-scripts --save-exact $WANT >/dev/null

TYPES="$NODE_DIR/node_modules/@grafana/schema/dist/types/raw"
GEN="$NODE_DIR/node_modules/.bin/ts-json-schema-generator"
rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp"
generate() {  # generate <types file> <type> <output base name>
  "$GEN" --path "$1" --type "$2" --no-type-check -o "$OUT.tmp/$3.strict.json"
  "$GEN" --path "$1" --type "$2" --no-type-check --additional-properties -o "$OUT.tmp/$3.open.json"
}
generate "$TYPES/dashboard/x/types.gen.d.ts" Dashboard dashboard
for panel in $PANELS; do
  generate "$TYPES/composable/$panel/panelcfg/x/types.gen.d.ts" Options "$panel.options"
  # stat declares no FieldConfig of its own (it has no custom field options)
  if grep -q '^export interface FieldConfig\b' "$TYPES/composable/$panel/panelcfg/x/types.gen.d.ts"; then
    generate "$TYPES/composable/$panel/panelcfg/x/types.gen.d.ts" FieldConfig "$panel.fieldconfig"
  fi
done
echo "$WANT" >"$OUT.tmp/.versions"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
echo "install-grafana-schema: wrote $(ls "$OUT" | wc -l) schemas to ${OUT#"$PWD"/}" >&2
