# Records -> tidy table -> the paper's tables and the figures. Nothing here runs a cell.


rule build_tidy_table:
    input:
        records=pretrain_records(),
    output:
        csv=f"{R}/tables/records.csv",
        parquet=f"{R}/tables/records.parquet",
    log:
        f"{R}/logs/report/build_tidy_table.log",
    script:
        "../scripts/build_tidy_table.py"


rule build_paper_table:
    input:
        tidy=f"{R}/tables/records.csv",
        reference="config/reference/{table}.csv",
    output:
        csv=f"{R}/tables/{{table}}.csv",
        md=f"{R}/tables/{{table}}.md",
    log:
        f"{R}/logs/report/build_paper_table-{{table}}.log",
    script:
        "../scripts/build_paper_table.py"


rule plot_pretrain:
    input:
        tidy=f"{R}/tables/records.csv",
    output:
        html=f"{R}/figures/pretrain.html",
        svg=f"{R}/figures/pretrain.svg",
        png=f"{R}/figures/pretrain.png",
    log:
        f"{R}/logs/report/plot_pretrain.log",
    script:
        "../scripts/plot_pretrain.py"
