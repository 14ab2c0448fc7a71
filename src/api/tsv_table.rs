// A reader for the API tables (`src/api/*.tsv`), shared by the build scripts that expand them
// (`include!`d by `src/api/build.rs` and the root `build.rs`): columns are found by the names in the
// table's header line (`# name<TAB>name...`, the last comment line with a tab), never by position, so
// that a column added by `scripts/gen-entry-points.py` cannot shift what a script reads.

/// One API table: its column names and its rows.
pub struct Table {
    path: String,
    columns: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Reads `path`; a missing header or a row whose width differs from it stops the build, naming both.
    pub fn read(path: &str) -> Table {
        println!("cargo:rerun-if-changed={path}");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        let columns: Vec<String> = text
            .lines()
            .rfind(|l| l.starts_with('#') && l.contains('\t'))
            .unwrap_or_else(|| panic!("{path}: no header line (`# name<TAB>name...`)"))
            .trim_start_matches('#')
            .trim_start()
            .split('\t')
            .map(str::to_owned)
            .collect();
        let rows: Vec<Vec<String>> = text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| l.split('\t').map(str::to_owned).collect())
            .collect();
        for r in &rows {
            assert_eq!(
                r.len(),
                columns.len(),
                "{path}: row {r:?} has {} fields, the header {columns:?} names {}",
                r.len(),
                columns.len()
            );
        }
        Table {
            path: path.to_owned(),
            columns,
            rows,
        }
    }

    /// The position of column `name` (the build stops when the table has none).
    pub fn column(&self, name: &str) -> usize {
        self.columns
            .iter()
            .position(|c| c == name)
            .unwrap_or_else(|| panic!("{}: no column {name:?} in {:?}", self.path, self.columns))
    }

    /// Every row, as a lookup by column name.
    pub fn rows(&self) -> impl Iterator<Item = Row<'_>> {
        self.rows.iter().map(move |cells| Row { table: self, cells })
    }
}

/// One row of a [`Table`].
pub struct Row<'a> {
    table: &'a Table,
    cells: &'a [String],
}

impl<'a> Row<'a> {
    /// The cell in column `name`.
    pub fn get(&self, name: &str) -> &'a str {
        &self.cells[self.table.column(name)]
    }
}
